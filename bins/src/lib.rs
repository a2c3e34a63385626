//! Shared flag-parsing helpers for the command-line front ends.
