// The Event Grid system topic's identity on the dead-letter container, and nothing else.

@description('Principal id of the system topic\'s system-assigned identity.')
param systemTopicPrincipalId string

@description('Name of the host storage account.')
param storageAccountName string

@description('Container Event Grid writes undeliverable notifications to.')
param deadLetterContainerName string

// Storage Blob Data Contributor
var storageBlobDataContributor = 'ba92f5b4-2d11-453d-a403-e96b0029c9fe'

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' existing = {
  name: storageAccountName
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' existing = {
  parent: storage
  name: 'default'
}

resource deadLetterContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' existing = {
  parent: blobService
  name: deadLetterContainerName
}

// Storage Blob Data Contributor: Event Grid dead-letters with the topic's identity
// (deadLetterWithResourceIdentity): the account has shared keys turned off. Scoped to the
// one container, so the topic reads or writes no other blob.
resource topicWritesDeadLetters 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  scope: deadLetterContainer
  name: guid(deadLetterContainer.id, systemTopicPrincipalId, storageBlobDataContributor)
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', storageBlobDataContributor)
    principalId: systemTopicPrincipalId
    principalType: 'ServicePrincipal'
  }
}
