"""Doubles of the AI binding shipped as library code (as httpx ships `MockTransport`): fault
injection around a real binding, and a scripted binding for tests."""
