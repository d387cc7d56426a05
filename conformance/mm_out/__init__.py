"""The mm_out chapter: test_mm_out.py and the helpers only it imports."""
