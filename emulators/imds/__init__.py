"""emulators/imds"""
