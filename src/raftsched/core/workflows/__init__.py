"""workflows"""
