"""One module per exercise: ``exNN_<topic>.py`` holds the checks of exercise NN (see ``course_lib.grading.api``)."""
