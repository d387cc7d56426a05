"""The streams_threads chapter: test_streams_threads.py and the helpers only it imports."""
