#!/bin/bash
# Print the number of words in the file given as the only argument.
wc -l < "$1"
