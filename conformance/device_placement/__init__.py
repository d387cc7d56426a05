"""The device_placement chapter: test_device_placement.py and the helpers only it imports."""
