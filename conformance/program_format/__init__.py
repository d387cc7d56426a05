"""program_format"""
