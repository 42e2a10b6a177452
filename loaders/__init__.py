"""Data views and loaders for on-device training (numpy only; never imports edgetrain). Coming with issue 5."""
