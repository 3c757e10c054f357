"""What every layer stands on, importing nothing else of mpicd: typed config sections (schema), named
random streams (seeds), files nobody else can choose (exclusive), durations as people read them."""
