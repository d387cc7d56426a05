"""streams_threads"""
