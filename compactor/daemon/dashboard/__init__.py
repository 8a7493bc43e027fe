"""The daemon's read-only web dashboard: pages, the JSON API they read, and access control."""
