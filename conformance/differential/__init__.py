"""differential"""
