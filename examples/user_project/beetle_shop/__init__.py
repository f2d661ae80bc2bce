"""A small user project: a shop whose card charges and receipts must happen exactly once."""
