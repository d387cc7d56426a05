"""The bad_inputs chapter: test_bad_inputs.py and the helpers only it imports."""
