"""The differential chapter: test_differential.py and the helpers only it imports."""
