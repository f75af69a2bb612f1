"""The HTTP layer: routes decode, call the store, and encode; nothing more."""
