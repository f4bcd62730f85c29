"""Profiler: ``mstx`` marks and ranges, profiling sessions, trace sinks, FLOPs and MFU/HFU."""
