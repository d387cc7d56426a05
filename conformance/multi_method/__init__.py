"""The multi_method chapter: test_multi_method.py and the helpers only it imports."""
