"""The runtime_options chapter: test_runtime_options.py and the helpers only it imports."""
