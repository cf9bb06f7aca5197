"""What several commands use (a command folder imports this and the library, never another
command's folder)."""
