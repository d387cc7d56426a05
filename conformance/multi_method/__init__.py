"""multi_method"""
