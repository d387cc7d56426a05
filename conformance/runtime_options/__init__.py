"""runtime_options"""
