"""The ground floor: errors, the config file's reading, small I/O, job accounting and the analysis registry; imports nothing else of posmech."""
