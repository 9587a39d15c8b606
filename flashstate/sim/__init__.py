"""Discrete-event simulator (`flashstate simulate`): the real scheduler and prefix cache, pools as counters,
time from a hardware profile's performance model; the bench replay's workloads, records and report."""
