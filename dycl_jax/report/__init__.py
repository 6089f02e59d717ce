"""Report stage: the conversion record as data, and its rich rendering."""
