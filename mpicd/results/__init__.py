"""The results file: its datasets declared once (columns), the collective writer (writer), the reader
(reader), and ``mpicd verify`` (verify). ``Results``, ``ResultsFileError`` and ``load`` are its public face."""

from mpicd.results.reader import load, Results, ResultsFileError

__all__ = ["Results", "ResultsFileError", "load"]
