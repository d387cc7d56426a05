"""traffic_meter"""
