"""emulators/servicebus"""
