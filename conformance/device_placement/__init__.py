"""device_placement"""
