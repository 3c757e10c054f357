"""mpicd: federated-learning experiments as MPI jobs, one rank per client."""

__version__ = "0.1.0"
