"""Pure rules: no I/O, no asyncio, no reading the clock. Time is a parameter."""
