"""The runtime core: the scheduler (decide), the engine contract and its events, the drive loop."""
