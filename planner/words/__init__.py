"""Every sentence a plan or a message carries: decisions arrive as records, leave as notes."""
