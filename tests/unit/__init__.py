"""Pure functions against slow oracles and properties (hypothesis); no cluster, no subprocess."""
