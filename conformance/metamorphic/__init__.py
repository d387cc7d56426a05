"""metamorphic"""
