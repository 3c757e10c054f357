"""The networks (a feature extractor and a head) and the optimizers that train them."""
