"""The Lark grammar of the .pen language (penrose.lark), shipped inside the package."""
