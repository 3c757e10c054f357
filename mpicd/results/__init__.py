"""The results file: its columns, the collective writer, the reader (file), and ``mpicd verify``
(verify). ``Results``, ``ResultsFileError`` and ``load`` are its public face."""

from mpicd.results.file import Results, ResultsFileError, load

__all__ = ["Results", "ResultsFileError", "load"]
