"""The numpy definitions of what pyq2 computes: block formats, layouts, reference arithmetic."""
