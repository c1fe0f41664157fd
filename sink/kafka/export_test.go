package kafka

// Murmur2 is the partitioner's hash, for the tests.
var Murmur2 = murmur2
