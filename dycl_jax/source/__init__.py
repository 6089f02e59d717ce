"""Source stage: reading and parsing the methods to convert."""
