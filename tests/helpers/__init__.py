"""Test helpers shared by every test room (imported as `helpers.<module>`)."""
