"""The run format (schema, writer, reader), importers and exporters."""
