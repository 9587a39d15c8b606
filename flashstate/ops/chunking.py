"""FLA's chunk length: the token granularity of flash-linear-attention's chunked passes, which the varlen
drivers, the forward metadata and the mixed-step buckets all align to. No torch here: the simulator's
bucket shapes read it too."""

FLA_CHUNK = 64
