"""Learning curves: downsampled on the server, kept warm by a background keeper."""
