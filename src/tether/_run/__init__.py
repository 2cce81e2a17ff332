"""The driver: what takes a held run to its next stop (DESIGN 5, 7, 10; DURABILITY 1, 2).

Nothing here is public; ``tether.Agent`` and ``tether.Worker`` are its callers.
"""
