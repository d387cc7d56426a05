"""bad_inputs"""
