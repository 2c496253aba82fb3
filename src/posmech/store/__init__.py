"""Stored artifacts: HDF5 files (checksums, kinds, provenance) and tidy tables with their metadata sidecars."""
