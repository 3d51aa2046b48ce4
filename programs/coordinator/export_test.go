package coordinator

// EnumVariants lets the external tests fill enum fields with valid values.
var EnumVariants = enumVariants
