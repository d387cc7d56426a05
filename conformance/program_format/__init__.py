"""The program_format chapter: test_program_format.py and the helpers only it imports."""
