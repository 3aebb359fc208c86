"""What a loader does about the frameworks that build or wrap it (checks made where
their code would otherwise change it silently)."""
