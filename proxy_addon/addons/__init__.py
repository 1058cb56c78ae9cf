"""The mitmproxy addons: small hooks that decide and delegate, and the state they share."""
