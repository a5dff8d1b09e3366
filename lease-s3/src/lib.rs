//! Placeholder: the backend arrives in its own issue.
