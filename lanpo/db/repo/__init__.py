"""Repositories of the experience store: typed functions that take a Session and never open one.

problems, runs, attempts, experiences (with capacity policies), sampling and the two feedback
contexts. Every function raises `InputError` for input a user can get wrong.
"""
