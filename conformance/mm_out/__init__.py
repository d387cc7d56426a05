"""mm_out"""
