"""The metamorphic chapter: test_metamorphic.py and the helpers only it imports."""
