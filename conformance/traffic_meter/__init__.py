"""The traffic_meter chapter: test_traffic_meter.py and the helpers only it imports."""
